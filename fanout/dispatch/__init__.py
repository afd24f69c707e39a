"""The collaborators :class:`fanout.fan_out.FanOut` composes, each holding what it needs.

``FanOut`` is the one public class: it builds these, wires them together and keeps the
order of a batch's steps (:meth:`fanout.fan_out.FanOut.process`). Each module here holds
one group of what it does:

- :mod:`~fanout.dispatch.arguments`: the constructor's argument checks;
- :mod:`~fanout.dispatch.secrets`: the secrets of the locations and sinks it is given, and
  the masking of an error that may quote one;
- :mod:`~fanout.dispatch.opening`: building the sinks, their dead-letter targets, and
  opening them at the start;
- :mod:`~fanout.dispatch.closing`: closing the sinks, at :meth:`~fanout.fan_out.FanOut.close`
  and when the start fails, and those a thread still uses once it is done;
- :mod:`~fanout.dispatch.targets`: the checks of the sinks' targets that refuse a run's
  first batch, a checkpoint reset, or a lag sink opened late (lost, renamed, unmarked);
- :mod:`~fanout.dispatch.letters`: each sink's dead-letter target, now and before;
- :mod:`~fanout.dispatch.attempts`: whether an attempt is its batch's first, and the
  refusal of a replayed batch a sink cannot prove it holds;
- :mod:`~fanout.dispatch.backlog`: the catch-up calls (start it beside the query, the final
  catch-up, what is still behind);
- :mod:`~fanout.dispatch.settle`: announcing a batch, releasing what it held, and its
  report to the observers;
- :mod:`~fanout.dispatch.stopping`: a stop asked of a ``FanOut`` and of one built from its
  pickle beside a Spark Connect server.
"""
