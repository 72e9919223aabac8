"""``trimproxy top``: a live terminal view of a running proxy, from its ``/metrics``."""
