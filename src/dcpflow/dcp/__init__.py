"""dcpflow.dcp: the DCP state machines, without I/O.

Events in, actions out: the server's asyncio shells (dcpflow.server) feed these classes what
arrived and the time it is, and write what they return. Nothing here touches a socket, a timer, a
thread or the clock, so every rule can be tested without a server.
"""
