"""The over-limit cache's sizes (slidegate.backends.blocked), apart from it so that the settings can name its
default (LOCAL_CACHE_SIZE_IN_BYTES) and cost without loading a backend."""

# What one remembered limit costs besides its key: its slot in the dict and the tuples and integers of its entry.
# Measured with tracemalloc: 206-235 bytes an entry at 1,000 to 100,000 entries; rounded up, so that the bytes
# charged are never fewer than the bytes taken (tests/test_blocked_cache.py measures it again).
ENTRY_BYTES = 320
DEFAULT_MAX_BYTES = 32 * 1024 * 1024  # about 70,000 limits with keys of 100 characters
