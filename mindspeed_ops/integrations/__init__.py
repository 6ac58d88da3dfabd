"""Model integrations (transformers)."""
