"""The xg2 Serve application: an OpenAI-style server that decodes with xg2's grammar constraints."""
