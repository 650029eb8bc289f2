"""Model definitions with Hugging Face parameter names."""
