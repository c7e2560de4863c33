"""SGLang integration."""
