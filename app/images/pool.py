"""Image decoding's own few threads, apart from the pool where every request's prompt is planned
(app/tenants/prep_pool.py): images wait on each other, never on prompt planning, and a burst of slow images cannot
make other keys' plain requests miss their planning deadline. Within it, keys take turns (one key's bombs wait
behind each other, not in front of another key's photo), and a bounded queue keeps the encoded bytes held."""

from __future__ import annotations

from ..tenants.prep_pool import PreparationPool

# Pillow releases the GIL while it decodes: two threads give images at most two cores of this process,
# the rest stays with planning, SSE and the event loop. One key decodes on one of them at a time.
THREADS = 2
# Images waiting for a thread, over every request of this process. The wait is bounded in time too
# (limits.image_decode_timeout_s); this bounds the encoded bytes held in the queue.
MAX_WAITING = 32

POOL = PreparationPool("image-decode", threads=THREADS, per_key=1, max_waiting=MAX_WAITING)
