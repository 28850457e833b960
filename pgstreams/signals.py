"""Signals pgstreams sends.

``stream_closed``: a stream was closed and the closing transaction committed (never for one that
rolled back). Sent with ``sender=Stream`` and the keyword arguments ``stream_id`` (a UUID),
``next_offset`` (how many chunks it holds) and ``using`` (the database alias), in the thread
that committed. For a stream's creation, Django's own ``post_save`` on ``Stream`` serves.
"""

from django.dispatch import Signal

stream_closed = Signal()
