"""MAVLink: codec, transports, protocols and autopilot flavours."""
