"""What a vehicle is: MAVLink messages in, state samples and events out, on the gateway's clock."""
