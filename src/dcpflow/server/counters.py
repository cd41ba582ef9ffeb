"""Per-bucket operation counters (memcached's cmd_get, get_hits... for `stats`): every KV request
counts here, so they are plain slotted attributes rather than a dict."""


class Counters:
    """Per-bucket operation counters for `stats` (memcached's names)."""

    __slots__ = ("cmd_get", "get_hits", "get_misses", "cmd_set", "cmd_delete")

    def __init__(self):
        self.cmd_get = self.get_hits = self.get_misses = self.cmd_set = self.cmd_delete = 0

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}
