"""The steps of one micro-batch, in the order :meth:`fanout.fan_out.FanOut.process` takes them:
context, guard, plan, persist, routes, write, record, settle."""
