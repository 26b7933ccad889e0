"""``kvd launch`` and ``kvd lint``: one deployment model, one set of rules, many formats.

The pieces (architecture decision 8):

* :mod:`infera.launch.model`: the deployment model (a daemon and engine legs, each with env and argv);
* :mod:`infera.launch.build`: the model from ``kvd launch single|pd`` options, correct by construction;
* :mod:`infera.launch.values`: the checks of the values written into commands (hosts, endpoints,
  paths, versions, ports of one host), shared by the options and the spec fields that mirror them;
* :mod:`infera.launch.spec`: the model as a spec file users keep in git (YAML or JSON), and
  :mod:`infera.launch.specfile`: reading one from disk (strictly, for ``kvd launch --spec``);
* :mod:`infera.launch.emit`: what ``kvd launch`` does with a deployment (check, save, print, write, run);
* :mod:`infera.launch.rules`: the rules, each with an id, a message, a fix and a docs page;
* :mod:`infera.launch.render`: the model through the Jinja2 templates of ``infera.templates``;
* :mod:`infera.launch.lint`: shell scripts, specs, manifests and units parsed back into the model.

Other tools (``kvd doctor``) build a :class:`~infera.launch.model.Deployment` from what they see on a
host and call :func:`infera.launch.rules.check` on it.
"""
