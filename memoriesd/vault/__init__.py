"""vault package."""
