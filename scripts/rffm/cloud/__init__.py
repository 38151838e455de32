"""Launching on the cloud: the preflight of a Google Cloud profile, the installed profiles, a Vertex AI custom job and
the post-training entry point it runs."""
