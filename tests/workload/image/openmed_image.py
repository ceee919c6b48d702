"""The application of the test image: the OpenMed REST service, answering a
request that names no model with the model it preloaded.

OpenMed 3.1 answers a request without ``model_name`` with a fixed model id
(``OpenMed/OpenMed-PII-SuperClinical-Small-44M-v1``) whatever it preloaded,
and refuses a model it did not preload (422). So while openmed-op rolls a
Deployment from one version to the next, no name a client could send is
served by every pod. An image that serves one preloaded model can make that
model its default, and this module does it without touching the service: it
wraps the service's own ASGI app and, for a JSON request body with no
``model_name``, fills in the first model of OPENMED_SERVICE_PRELOAD_MODELS.
A request that names a model passes unchanged, and gets the service's own
answer. The response's ``model_name`` says which model answered.

Started with the service's own launcher:

    python -m openmed.service.logging openmed_image:app --host 0.0.0.0 --port 8080
"""

import json
import os

from openmed.service.app import app as service_app
from openmed.service.runtime import SERVICE_PRELOAD_ENV_VAR, parse_preload_models

# Bodies larger than this pass unchanged (the service has its own limits).
MAX_BODY_BYTES = 8 * 1024 * 1024
# The endpoints whose requests carry model_name.
MODEL_PATH_PREFIXES = ("/pii/", "/analyze")


def preloaded_default():
    models = parse_preload_models(os.getenv(SERVICE_PRELOAD_ENV_VAR))
    return models[0] if models else None


class DefaultModel:
    """ASGI middleware: the preloaded model is the default model_name."""

    def __init__(self, app, model, pod=None):
        self.app = app
        self.model = model
        self.pod = pod

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.pod:
            send = self.naming_pod(send)
        if (
            self.model is None
            or scope["type"] != "http"
            or scope.get("method") != "POST"
            or not scope.get("path", "").startswith(MODEL_PATH_PREFIXES)
            or not dict(scope.get("headers") or []).get(b"content-type", b"").startswith(b"application/json")
        ):
            await self.app(scope, receive, send)
            return
        body, replay = b"", []
        while True:
            message = await receive()
            replay.append(message)
            if message["type"] != "http.request":
                break  # the client went away: let the service see it
            body += message.get("body", b"")
            if len(body) > MAX_BODY_BYTES or not message.get("more_body", False):
                break
        done = replay[-1]["type"] == "http.request" and not replay[-1].get("more_body", False)
        if done and len(body) <= MAX_BODY_BYTES:
            changed = self.with_default(body)
            if changed is not None:
                body = changed
                scope = dict(scope)
                scope["headers"] = [
                    (k, v) for k, v in scope["headers"] if k != b"content-length"
                ] + [(b"content-length", str(len(body)).encode())]
                replay = [{"type": "http.request", "body": body, "more_body": False}]
        pending = list(replay)

        async def replaying_receive():
            if pending:
                return pending.pop(0)
            return await receive()

        await self.app(scope, replaying_receive, send)

    def naming_pod(self, send):
        pod = self.pod.encode()

        async def send_with_pod(message):
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = list(message.get("headers") or []) + [(b"x-openmed-pod", pod)]
            await send(message)

        return send_with_pod

    def with_default(self, body):
        try:
            payload = json.loads(body)
        except ValueError:
            return None  # the service answers malformed JSON itself
        if not isinstance(payload, dict) or "model_name" in payload:
            return None
        payload["model_name"] = self.model
        return json.dumps(payload).encode()


app = DefaultModel(service_app, preloaded_default(), os.getenv("HOSTNAME"))
