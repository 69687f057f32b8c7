"""Code shared by the API and the workers: settings, schemas, Redis layout, Celery config.

Every llmq process imports this package before any library that reports usage, so importing it
turns that reporting off (common/no_telemetry.py) for the process and every process it starts.
"""
from common import no_telemetry

no_telemetry.apply()
