"""index package."""
