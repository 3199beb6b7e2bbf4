// Package kvevent owns the KV event wire format of xLLM engines: the
// 3-frame live envelope, the replay (snapshot) frames and the MessagePack
// batches and events inside them, in every shape the engines send
// (R-WIRE). It decodes into reusable typed values without generic
// interfaces, bounded by a maximum message size before any allocation
// proportional to a claimed length, and encodes the same shapes for the
// engine emulator.
//
// It must not know about streams, indexes or sockets: it turns bytes into
// events and events into bytes, nothing more.
package kvevent
