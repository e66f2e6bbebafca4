"""Channels over TCP: message framing, output channels with priority events, input gates with credits."""
