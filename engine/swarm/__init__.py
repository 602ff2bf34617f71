"""The swarm: protocol, identity, client, relay and brokers (engine/swarm knows nothing of training)."""
