"""AMQP 1.0 adapter: applications on gateway queues and topics through python-qpid-proton's engine."""
