"""The routing core: a request's route, written once for the live node and the simulator.

:class:`~tierlink.routing.router.Router` does what happens between a request's arrival and
its dispatch, and after its answer: the receipt (may this node hold it, is any deadline
left), the policy that places it, the plan (with a shadow candidate deciding beside it), and
the feedback to a learning policy and the shadow log. It decides and hands back; the live
node (asyncio, HTTP) and the simulator (virtual time) carry the plan out through the same
dispatcher. :class:`~tierlink.routing.desk.PolicyDesk` is its receipt and policy choice.
"""
