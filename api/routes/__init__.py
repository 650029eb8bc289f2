"""HTTP routers of the API, one module per resource."""
