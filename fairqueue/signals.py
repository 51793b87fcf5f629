"""Signal receivers fairqueue installs (filled in as models arrive)."""
