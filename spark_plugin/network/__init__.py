"""The data plane between subtasks: the wire format (incl. the barrier's bytes), records framed in buffers, input
gates with credit-based flow control and their channel-state persisters, output partitions where priority barriers
overtake queued buffers, recovered channel state read back and redistributed on a restore, and connection set-up."""
