"""Model implementations and weight loaders."""
