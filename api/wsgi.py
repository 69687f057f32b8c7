"""WSGI entry point for gunicorn: `gunicorn -c ops/gunicorn.conf.py api.wsgi:app` (gevent workers)."""
from common.logs import setup_logging
from common.settings import get_settings

from api import create_app

setup_logging(get_settings(), "api")
app = create_app()
