"""The reconciliation job: reads the delivery logs of one or many gateways and says, message by
message and route by route, what became of each message.

Every transform is a pure DataFrame -> DataFrame function in a module of its own
(``schema``, ``read``, ``verdicts``); the job only wires them. pyspark is an optional extra
(``pip install gateway[spark]``); nothing in the gateway's runtime imports this package.
"""
