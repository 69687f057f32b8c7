"""Code shared by the API and the workers: settings, schemas, Redis layout, Celery config."""
