"""Traces and logs (docs/operations.md, "Traces and logs").

- `tracing`: OpenTelemetry, off unless configured; the trace of a decision follows it from
  the web request into the queued resume task and the worker's model call.
- `logs`: the run id, request id and user added to every log line about them, as text (the
  default, unchanged) or JSON.
- `middleware`: binds both for the web request being handled.

The lowest layer: anything in the app may use it, and it imports nothing of the app's but
its settings.
"""
