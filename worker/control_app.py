"""The Celery app of the model-less control worker (`python -m worker.control`), and the stores its
tasks share.

Its own module so that every control task module (webhook deliveries, batch steps) registers on
the one app that `worker.control` runs, whichever of them is imported first; and so that they all
talk to Redis through one client.
"""
from __future__ import annotations

from common.celery_app import make_celery
from common.settings import get_settings
from common.stores import Stores

app = make_celery(get_settings(), consumer=True)
_stores: Stores | None = None


def stores() -> Stores:
    """Built on first use: importing a task module must not connect to anything."""
    global _stores
    if _stores is None:
        _stores = Stores(get_settings(), celery=app)
    return _stores
