"""HTTP endpoints: each answers at once and leaves the work to the queue's worker."""

from __future__ import annotations

from datetime import UTC
from datetime import datetime
from typing import Any

from flask import Blueprint
from flask import Response
from flask import jsonify
from flask import request
from flask import url_for

from flask_sqlqueue import Job

from .tasks import REPORT_FORMATS
from .tasks import build_report
from .tasks import call_flaky_api
from .tasks import handle_payment_event
from .tasks import queue

bp = Blueprint("example", __name__)

INDEX = """\
flask_sqlqueue example app

Try (the worker runs the jobs: `flask --app example_app queue work`):

  POST /webhooks/payments          a payment provider's webhook; the event "id" is the
                                   idempotency key, so a repeated delivery makes no new job
      curl -s -X POST {root}webhooks/payments -H 'Content-Type: application/json' \\
           -d '{{"id": "evt_1001", "type": "payment.succeeded", "data": {{"amount": 1299}}}}'

  POST /reports                    build a report in the background; the job's result is JSON
      curl -s -X POST {root}reports -H 'Content-Type: application/json' \\
           -d '{{"report_id": 7, "format": "csv"}}'

  POST /orders/<id>/shipping-quote call a partner API that fails half the time: watch the
                                   retries, and the jobs that end dead
      curl -s -X POST {root}orders/42/shipping-quote

  GET  /jobs/<id>                  a job as JSON: status, attempts, last error, result
      curl -s {root}jobs/1

  GET  /admin/                     the queue's admin dashboard, in a browser: jobs, dead
                                   letters, workers, retries (open to this machine, with
                                   no login: a demo, do not deploy like this)
      {root}admin/

From a shell in the repository:

  flask --app example_app queue status
  flask --app example_app queue list --status dead
  flask --app example_app queue show 1
  flask --app example_app queue retry --dead
"""


def error(message: str, status: int = 400) -> tuple[Response, int]:
    return jsonify(error=message), status


def accepted(job: Job, **extra: Any) -> tuple[Response, int, dict[str, str]]:
    """202 with the job's id and where to follow it."""
    location = url_for("example.show_job", job_id=job.id)
    body = jsonify(job_id=job.id, status=str(job.status), url=location, **extra)
    return body, 202, {"Location": location}


def _when(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def job_json(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "task": job.task,
        "queue": job.queue,
        "status": str(job.status),
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "priority": job.priority,
        "idempotency_key": job.idempotency_key,
        "args": job.args,
        "kwargs": job.kwargs,
        "result": job.result,
        "last_error": job.last_error,
        # Tracebacks stay in `flask queue show`: an HTTP API should not hand them out.
        "errors": [
            {key: record.get(key) for key in ("attempt", "type", "message", "at")}
            for record in job.errors
            if isinstance(record, dict)
        ],
        "run_at": _when(job.run_at),
        "created_at": _when(job.created_at),
        "updated_at": _when(job.updated_at),
        "started_at": _when(job.started_at),
        "finished_at": _when(job.finished_at),
        "worker_id": job.worker_id,
    }


def json_object() -> dict[str, Any] | None:
    """The request body as a JSON object, or ``None`` if it is not one."""
    body = request.get_json(force=True, silent=True)
    return body if isinstance(body, dict) else None


@bp.get("/")
def index() -> Response:
    return Response(INDEX.format(root=request.host_url), mimetype="text/plain")


@bp.post("/webhooks/payments")
def payment_webhook() -> Any:
    # A real endpoint checks the provider's signature header before anything else.
    event = json_object()
    if event is None:
        return error("The request body must be a JSON object (a payment event).")
    event_id = event.get("id")
    if not isinstance(event_id, str) or not 1 <= len(event_id) <= 255 or "\x00" in event_id:
        return error('The event needs an "id": a string of 1 to 255 characters.')
    before = datetime.now(UTC)
    try:
        job = handle_payment_event.using(idempotency_key=event_id).enqueue(event)
    except (TypeError, ValueError) as exc:  # e.g. NaN in the body: not storable as JSON
        return error(f"The event cannot be queued: {exc}")
    # Providers retry deliveries until they see a 2xx: a repeat gets the same answer.
    return accepted(job, duplicate=job.created_at < before)


@bp.post("/reports")
def request_report() -> Any:
    body = json_object()
    if body is None:
        return error('The request body must be a JSON object like {"report_id": 7}.')
    report_id = body.get("report_id")
    fmt = body.get("format", "json")
    if type(report_id) is not int or report_id < 1:
        return error('"report_id" must be a whole number of 1 or more.')
    if fmt not in REPORT_FORMATS:
        return error(f'"format" must be one of {", ".join(REPORT_FORMATS)}.')
    return accepted(build_report.enqueue(report_id, fmt))


@bp.post("/orders/<int:order_id>/shipping-quote")
def request_shipping_quote(order_id: int) -> Any:
    return accepted(call_flaky_api.enqueue(order_id))


@bp.get("/jobs/<int:job_id>")
def show_job(job_id: int) -> Any:
    job = queue.get_job(job_id)
    if job is None:
        return error(f"No job with id {job_id}.", 404)
    return jsonify(job_json(job))
