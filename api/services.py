"""What request handlers need, built once per app and kept in `app.extensions['llmq']`: llmq's
stores and admission (common/), and what only the API has: rate and stream limits, the SSE
wake-ups and the places of waiting streams."""
from __future__ import annotations

from flask import current_app

from api.fleet import FleetView
from api.queue_places import QueuePlaces
from api.ratelimit import RateLimiter
from api.stream_limits import StreamLimits
from api.wakeups import JobWakeups
from common.admission import Admission
from common.demand import ModelDemand, model_demand
from common.settings import Settings
from common.stores import Stores


class Services(Stores):
    def __init__(self, settings: Settings):
        # Under gevent thousands of requests share the process, yet it runs one at a time and Redis
        # answers one command at a time, so a few dozen sockets keep both busy; a caller past them
        # waits for one (a few seconds at most, then 503) rather than opening a socket each. More
        # sockets made a burst slower, not faster: each is opened and set up on first use and
        # health-checked after it idles (docs/front-door.md).
        super().__init__(settings, wait_for_connection_s=5, max_connections=32)
        self.admission = Admission(self)
        self.limits = RateLimiter(self.redis, self.keys, settings)
        self.wakeups = JobWakeups(self.redis, self.keys)
        self.places = QueuePlaces(self.jobs, self.registry, self.model_loads, settings.queue_place_interval_s,
                                  settings.queue_place_every_s)
        self.streams = StreamLimits(self.redis, self.keys, settings)
        self.fleet = FleetView(self.registry, self.model_loads)

    def model_demands(self, workers: list[dict]) -> list[ModelDemand]:
        """Every catalog model's demand and state (and any model a live worker in `workers`
        serves): for /v1/models, /health and /metrics."""
        return model_demand(self, set(self.admission.served_models()), workers, self.settings.max_batch_size)


def services() -> Services:
    return current_app.extensions["llmq"]
