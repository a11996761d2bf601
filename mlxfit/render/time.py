"""How long the run takes, in one line of probe's answer."""

from __future__ import annotations


def clock(seconds: float) -> str:
    """A run's length as a person says it: 40 s, 12 min, 2 h 40 min, 3 days 4 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = seconds / 60
    if minutes < 60:
        return f"{minutes:.0f} min"
    if minutes < 48 * 60:
        step = 5 if minutes >= 3 * 60 else 1
        whole = int(round(minutes / step) * step)
        h, m = divmod(whole, 60)
        return f"{h} h" if m == 0 else f"{h} h {m} min"
    days, hours = divmod(int(round(minutes / 60)), 24)
    return f"{days} days" if hours == 0 else f"{days} days {hours} h"


def time_line(time, checkpointed=None) -> str:
    """about 2 h 40 min for 1,000 iterations on an M2 Pro; 3 h 25 min with --grad-checkpoint"""
    speed = time.speed
    where = f"on an {speed.chip}" if speed.chip and speed.chip[0] in "AEIOUM" else (
        f"on a {speed.chip}" if speed.chip else "here")
    low, high = time.range
    line = (f"about {clock(time.seconds)} for {time.iters:,} iterations {where} "
            f"({clock(low)}-{clock(high)}; {time.mean_step_seconds:.3g} s a step")
    line += ", over --data's batch widths)" if time.from_data else ")"
    if checkpointed is not None:
        line += f"; {clock(checkpointed.seconds)} with --grad-checkpoint"
    if speed.correction:
        line += f"; {correction_words(speed.correction)}"
    return line


def correction_words(c: dict) -> str:
    """corrected by your measurement of 305 tokens/s (batch 4 × 512 tokens, 2025-03-01): 1.31× the rates' estimate"""
    pace = f"{c['tokens_per_second']:,.0f} tokens/s" if c.get("tokens_per_second") else f"{c['step_seconds']:.3g} s a step"
    when = f", {c['date']}" if c.get("date") else ""
    return (f"corrected by your measurement of {pace} (batch {c['batch_size']} × {c['width']:,} tokens{when}): "
            f"{c['factor']:.2f}× the estimate at this machine's rates")


def cost_in_time(run_seconds, iters, now_seconds, now_iters) -> str:
    """What a remedy's run takes beside the run as given: "3 h 10 min (2 h 30 min now)";
    a smaller batch names its iterations: "... for 4,000 iterations, the same examples"."""
    if run_seconds is None:
        return ""
    words = clock(run_seconds)
    if iters is not None and now_iters is not None and iters != now_iters:
        words += f" for {iters:,} iterations, the same examples"
    return words + (f" ({clock(now_seconds)} now)" if now_seconds is not None else "")


def measured_line(measured: dict) -> str:
    """measured here: 305 tokens/s after the first step; the whole run at that pace, about 3 h 10 min"""
    return (f"measured here: {measured['tokens_per_second']:,.0f} tokens/s after the first step "
            f"({measured['step_seconds']:.3g} s a step, {measured['predicted_step_seconds']:.3g} s predicted); "
            f"{measured['iters']:,} iterations at that pace, about {clock(measured['run_seconds'])}")


def render_time(time, checkpointed=None, measured=None) -> None:
    from .text import console

    if time is not None:
        console.print(f"Time: {time_line(time, checkpointed)}")
    if measured is not None:
        console.print(f"Time {measured_line(measured)}")
