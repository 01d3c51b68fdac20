"""`log_list`: the vehicle's own list of dataflash logs (LOG_REQUEST_LIST → LOG_ENTRY), in the cmd_result.

Unlike `log_download` it runs inside the command: a listing is one LOG_ENTRY
per log, a fraction of a second even for hundreds of logs. ArduPilot answers
no LOG_* message while armed (its first one gets STATUSTEXT "Disarm for log
download", the rest silence), so there the command is refused while armed
instead of timing out. PX4 is not refused (its behaviour armed is not
recorded here: a silent PX4 ends `timeout`, as any unanswered request).
"""

from __future__ import annotations

from typing import Any

from mavjet.contract.commands import CmdResult, Command
from mavjet.drivers.mavlink.logs import LogEntry
from mavjet.gateway.commands.actions import ActionContext, Outcome
from mavjet.gateway.commands.logs import object_name
from mavjet.gateway.services import LiveState

MAX_ENTRIES = 256  # a cmd_result stays one small message; the newest are kept (ArduPilot numbers up to 500)


def entry_row(vid: str, entry: LogEntry) -> dict[str, Any]:
    return {"log_id": entry.log_id, "size_bytes": entry.size_bytes, "time_utc_s": entry.time_utc_s,
            "object": object_name(vid, entry)}


def log_list_failure(cmd: Command, state: LiveState) -> str | None:
    if state.flavour == "px4" or state.armed is False:
        return None
    why = "the vehicle is armed" if state.armed else "its armed state is unknown"
    return f"log_list needs the vehicle disarmed ({why}; ArduPilot answers no log request while armed)"


async def log_list(cmd: Command, ctx: ActionContext) -> Outcome:
    if ctx.vehicle.session.log_download_active:  # the vehicle would not answer: refuse now, not after a timeout
        return Outcome(result=CmdResult.REJECTED, detail="a log download from this vehicle is running; list its "
                       "logs when it has ended (the autopilot serves one log transfer at a time)")
    entries = await ctx.vehicle.session.list_logs()
    rows = [entry_row(ctx.vehicle.vid, e) for e in entries][-MAX_ENTRIES:]
    total_bytes = sum(e.size_bytes for e in entries)
    more = f" (the newest {len(rows)} listed)" if len(rows) < len(entries) else ""
    return Outcome(result=CmdResult.ACCEPTED, attempts=1,
                   extra={"logs": rows, "count": len(entries), "total_bytes": total_bytes},
                   detail=f"{len(entries)} log{'' if len(entries) == 1 else 's'}, {total_bytes} bytes{more}")
