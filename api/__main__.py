"""Development server: `python -m api [--host H] [--port P]`. Production: gunicorn 'api.wsgi:app'."""
import argparse

from common.logs import setup_logging
from common.settings import get_settings

from api import create_app

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m api")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    setup_logging(get_settings(), "api")
    create_app().run(host=args.host, port=args.port, threaded=True)
