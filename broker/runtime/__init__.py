"""The service runtime: a service's context and heartbeats, control events,
supervision, a run's lifecycle."""
