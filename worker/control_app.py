"""The Celery app of the model-less control worker (`python -m worker.control`).

Its own module so that every control task module (webhook deliveries, batch steps) registers on
the one app that `worker.control` runs, whichever of them is imported first.
"""
from __future__ import annotations

from common.broker import transport_for
from common.celery_app import make_celery
from common.settings import get_settings

app = make_celery(get_settings())
app.conf.broker_transport = transport_for(get_settings())  # rides out Redis outages and failovers
