"""dcpflow.dcp: the DCP state machines, without I/O.

Events in, actions out, in the manner of h11: the server's asyncio shells (dcpflow.server's
producer, consumer, backfill and dcp_commands modules) hand these classes what arrived and the
time it is, and write what they return. Nothing here opens a socket, arms a timer, starts a thread
or reads the clock, so every rule of the protocol is testable without a server, and the shells are
left with transport, timers and scheduling.

The rules follow kv_engine's DCP documentation,
https://github.com/couchbase/kv_engine/tree/master/docs/dcp/documentation (one page per command
under commands/, and the overview pages flow-control.md, dead-connections.md, rebalance.md,
rollback.md), with names a reader of those pages finds here. One job per module:

Producer side (a consumer asked this node for vbucket streams):
  producer        DcpProducer: one producer connection's state and its answers to requests
  controls        DCP_CONTROL as a table: key -> value rules -> effect
  flow_control    the producer's window (and the consumer's acknowledgements)
  noop            when to send a DCP_NOOP, when to give up on an idle consumer
  stream_request  DCP_STREAM_REQ's checks, the flags' ranges, the rollback decision
  streams         the registry of a connection's streams, and which may have work
  send_pass       one pass: which queued messages go out now, under the window
  backfills       which backfills open next and how much they may read
  active_stream   ActiveStream: what one vbucket stream sends, encoded, in a ready queue
  stream_messages its encoding half: items, markers, events, sync writes into the ready queue
  stream_backfill its disk half: the pages a backfill hands it
  stream_types    a stream's states and options, a backfill's range, a ready-queue entry

Consumer side (this node replicates vbuckets from a producer elsewhere):
  consumer        DcpConsumer: ADD_STREAM, its stream requests, applying what arrives
  passive_stream  PassiveStream: one replicated vbucket's position
  position        the one consumer-side stream position: offsets, snapshots, stream ends and
                  rollback points, for the replica consumer and the client's Feed alike
                  (it imports only dcpflow.protocol)

errors            Refusal: a request turned down, as a value (status and reason)
outcomes          what every entry point answers: send, wake, arm a timer, stop a backfill,
                  change a vbucket state, roll back, close - the shells execute them

This package may use the engine (its vbuckets, checkpoint cursors and store pages) and the
protocol; neither of those imports it, and it imports nothing of the server.
"""
