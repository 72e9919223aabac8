"""The request path of a prompt route, top-down (docs/architecture.md §1, §2):
``handler`` (read → parse → prepare → forward → relay), ``chain`` (the Responses
API's stored chain), the prepare steps, ``forward``, ``relay`` and what a stream that
breaks off does (``breakoff``, ``continuation``, ``read_deadline``)."""
