"""Several engines behind one model (docs/engines.md): the engines, routing, health."""
