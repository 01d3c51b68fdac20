"""The JetStream stores for artifacts: TWIN_BLOBS (plans, blobs), TWIN_LOGS (flight logs), TWIN_TRACKS."""
