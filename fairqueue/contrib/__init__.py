"""Optional integrations, each importing its own third-party package."""
