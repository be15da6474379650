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

Between interactive requests (none in the step, but one in a step less than `RECENT_S` ago), a step keeps to the
time of the interactive steps before it: a client's next request, or a burst's, then waits for a step no longer
than theirs rather than for a batch step of every row (a closed loop of four clients, whose requests end and come
back together, waited 50 ms more for its first token)."""

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
# How long after a step with interactive rows the steps without them stay as short as those were.
RECENT_S = 1.0


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
        alone = times.seconds(recent_rows)
        return wanted if alone is None else min(wanted, max(1, times.rows_within(alone * (1 + SLOWDOWN), wanted)))
    budget = times.extra_rows(interactive_rows, PROMPT_SLOWDOWN if interactive_prompt else SLOWDOWN, wanted)
    if budget == 0 and wanted and starved_steps >= STARVED_STEPS:
        budget = 1
    return min(budget, wanted)
