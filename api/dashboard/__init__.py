"""The web dashboard: pages served by the API app, rendered in the browser from the JSON API."""
