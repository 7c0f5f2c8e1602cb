"""Training, whatever the method: the context every trainer receives and periodic evaluation during training
(the methods themselves live in :mod:`esrepro.es`, :mod:`esrepro.essa` and :mod:`esrepro.rl`)."""
