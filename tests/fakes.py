"""Stand-ins for the event loop's side of a protocol, for tests that drive one by hand."""


class FakeTransport:
    """An asyncio transport that records what it is asked to write and whether it was closed."""

    def __init__(self):
        self.written: list[bytes] = []
        self.aborted = False

    def write(self, data):
        self.written.append(bytes(data))

    def is_closing(self):
        return self.aborted

    def abort(self):
        self.aborted = True

    def close(self):
        self.aborted = True

    def get_extra_info(self, name, default=None):
        return default

    def set_write_buffer_limits(self, high=None, low=None):
        pass

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass
