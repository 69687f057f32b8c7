"""llmq worker: a Celery process holding one model and a continuous-batching engine."""
