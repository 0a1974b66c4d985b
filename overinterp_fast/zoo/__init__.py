"""Small real models and data that need no download (datasets shipped inside packages)."""
