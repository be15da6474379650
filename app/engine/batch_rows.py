"""How many rows batch lines get in a step beside interactive requests.

Slots are not enough to keep batch work out of interactive traffic's way (admission.py gives interactive requests
the slots first, and preempts batch lines for them): every row in a step makes the step longer, on a CPU by most
of a token's time, so twelve batch lines beside four interactive streams made each interactive token three times
slower. So while interactive requests run, batch lines get only the rows that keep the step within
`SLOWDOWN` of what the interactive rows alone take, by the engine's measured step times (step_times.py): on a GPU,
where rows are nearly free, that is all of them; on a CPU, one or two. A step that prefills an interactive prompt
(its first token, what its user waits for) keeps within `PROMPT_SLOWDOWN`, and batch lines that went
`STARVED_STEPS` steps without a row get one, so a long interactive stream never stalls a batch outright. Batch
lines take their turns round robin (the one that waited longest first).

Between interactive requests (none in the step, but one in a step less than `RECENT_S` ago), a step is short: a
client whose request just ended sends its next within milliseconds (a closed loop; an agent's next turn after a
tool call), and waits for the step under way, where alone it would have found the engine idle. So such a step
takes at most `BETWEEN_SHARE` of the interactive steps' time, or a one-row step's where even one row takes more
(a CPU: one row; a GPU, where a step of many rows takes a step of one's time: all). Four clients whose requests
ended together waited half a step of four rows (~10 ms of a 35 ms first token) beside a batch, none alone."""

from __future__ import annotations

from .step_times import StepTimes

# How much longer batch rows may make a step of interactive requests: half of the bound set on interactive latency
# beside a batch (1.2x); the rest goes to the wait for a step under way and to the CPU the batch's own requests take
# in the replica.
SLOWDOWN = 0.1
# The same for a step that prefills an interactive prompt: its time is the first token's.
PROMPT_SLOWDOWN = 0.02
# Steps batch lines may go without a row while interactive requests run, before one of them gets one.
STARVED_STEPS = 8
# How long after a step with interactive rows the steps without them stay short.
RECENT_S = 1.0
# Those steps' time, at most, as a share of the last interactive step's (or a one-row step's, where that is longer).
BETWEEN_SHARE = 0.25


def batch_row_budget(interactive_rows: int, interactive_prompt: bool, wanted: int, times: StepTimes,
                     starved_steps: int, recent_rows: int = 0) -> int | None:
    """Rows batch lines may have in this step, of the `wanted` they would take; None: as many as they want (no
    interactive request in the step or lately). `interactive_rows`: the interactive sequences' rows in it (prompt
    tokens included); `interactive_prompt`: whether it prefills an interactive prompt; `starved_steps`: steps since
    batch lines last had a row; `recent_rows`: the interactive sequences decoding in the last step that had
    interactive rows, if that was within RECENT_S (0: none)."""
    if interactive_rows <= 0:  # (an interactive prompt's tokens are interactive rows)
        if recent_rows <= 0:
            return None
        alone, one_row = times.seconds(recent_rows), times.seconds(1)
        if alone is None or one_row is None:
            return wanted
        limit = max(alone * BETWEEN_SHARE, one_row * (1 + SLOWDOWN))
        return min(wanted, max(1, times.rows_within(limit, wanted)))
    budget = times.extra_rows(interactive_rows, PROMPT_SLOWDOWN if interactive_prompt else SLOWDOWN, wanted)
    if budget == 0 and wanted and starved_steps >= STARVED_STEPS:
        budget = 1
    return min(budget, wanted)
