"""Every request and reply that crosses the bus to the engine (`gpuevents.engine.>`), one model each, imported by
both ends: the command line, Slack's clicks and the dashboard ask with them; the engine's servers validate them.

| subject | request | reply |
| --- | --- | --- |
| `gpuevents.engine.snooze` | `KeepRequest` (a snooze or an owner's keep) | `KeepReply` |
| `gpuevents.engine.act` | `OperatorAction` (gpuevents/wire/manual.py) | `OperatorActionReply` |
| `gpuevents.engine.status` | `StatusQuery` | `StatusSummary`, `StatusNode` or `StatusPage`, or `ErrorReply` |
| `gpuevents.engine.free` | `FreeQuery` (also `GET /api/free`'s) | `FreeReply` (a `FreeAnswer`), or `ErrorReply` |

The status and free replies are built by the engine from its read model (rules/engine/read/status.py,
rules/dashboard/free.py); the fleet's shapes they carry are in gpuevents/wire/fleet.py. A request that does not
validate is answered with an `ErrorReply` naming the field, never dropped. When no engine answers, nothing is
stored or done: the asker is told so (`NoEngine`) and may ask again.
"""

from gpuevents.wire.free import FreeAnswer, FreeQuery, FreeQueryError
from gpuevents.wire.keeps import KeepReply, KeepRequest, keep_request
from gpuevents.wire.manual import OperatorAction, OperatorActionReply
from gpuevents.wire.replies import ErrorReply, FreeReply, NoEngine, bad_request
from gpuevents.wire.status import TOP, StatusError, StatusNode, StatusPage, StatusQuery, StatusSummary

__all__ = ["TOP", "ErrorReply", "FreeAnswer", "FreeQuery", "FreeQueryError", "FreeReply", "KeepReply", "KeepRequest",
           "NoEngine", "OperatorAction", "OperatorActionReply", "StatusError", "StatusNode", "StatusPage",
           "StatusQuery", "StatusSummary", "bad_request", "keep_request"]
