"""The registry's dashboard: static pages that read the JSON API from the browser."""
