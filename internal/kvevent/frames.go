package kvevent

import (
	"encoding/binary"
	"fmt"
)

// ReplayEndSeq is the sequence number of the replay end marker
// (R-WIRE-3); it is never a real batch sequence.
const ReplayEndSeq uint64 = 0xFFFFFFFFFFFFFFFF

const seqFrameLen = 8

func parseSeq(frame []byte, what string) (uint64, error) {
	if len(frame) != seqFrameLen {
		return 0, fmt.Errorf("%w: %s: sequence frame is %d bytes, want %d", ErrMalformed, what, len(frame), seqFrameLen)
	}
	return binary.BigEndian.Uint64(frame), nil
}

func seqFrame(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, seqFrameLen), seq)
}

// ParseLive splits a live-channel message `topic | seq | payload`
// (R-WIRE-1). The returned slices alias frames.
func ParseLive(frames [][]byte) (topic []byte, seq uint64, payload []byte, err error) {
	if len(frames) != 3 {
		return nil, 0, nil, fmt.Errorf("%w: live message: got %d frames, want 3", ErrMalformed, len(frames))
	}
	seq, err = parseSeq(frames[1], "live message")
	if err != nil {
		return nil, 0, nil, err
	}
	return frames[0], seq, frames[2], nil
}

// ParseReplay splits a replay reply as a DEALER receives it:
// `empty | seq | payload`, or `empty | topic | seq | payload` from engines
// that repeat the topic (R-WIRE-3). end reports the end marker (seq
// ReplayEndSeq with an empty payload); a real batch never has an empty
// payload, so an empty one under any other sequence is malformed.
func ParseReplay(frames [][]byte) (seq uint64, payload []byte, end bool, err error) {
	var seqF, payloadF []byte
	switch len(frames) {
	case 3:
		seqF, payloadF = frames[1], frames[2]
	case 4:
		seqF, payloadF = frames[2], frames[3]
	default:
		return 0, nil, false, fmt.Errorf("%w: replay reply: got %d frames, want 3 or 4", ErrMalformed, len(frames))
	}
	if len(frames[0]) != 0 {
		return 0, nil, false, fmt.Errorf("%w: replay reply: first frame is %d bytes, want the empty delimiter", ErrMalformed, len(frames[0]))
	}
	seq, err = parseSeq(seqF, "replay reply")
	if err != nil {
		return 0, nil, false, err
	}
	switch {
	case seq == ReplayEndSeq && len(payloadF) == 0:
		return seq, nil, true, nil
	case seq == ReplayEndSeq:
		return 0, nil, false, fmt.Errorf("%w: replay reply: end marker carries a %d-byte payload", ErrMalformed, len(payloadF))
	case len(payloadF) == 0:
		return 0, nil, false, fmt.Errorf("%w: replay reply: seq %d has an empty payload", ErrMalformed, seq)
	}
	return seq, payloadF, false, nil
}

// ReplayTopic returns the topic frame of a 4-frame replay reply; ok is
// false for a 3-frame reply, which has none. The end marker of engines
// that send topics carries an empty one.
func ReplayTopic(frames [][]byte) (topic []byte, ok bool) {
	if len(frames) != 4 {
		return nil, false
	}
	return frames[1], true
}

// ParseReplayRequest reads the start sequence of a replay request as the
// engine's ROUTER sees it after the identity frame: `empty | seq`.
func ParseReplayRequest(frames [][]byte) (startSeq uint64, err error) {
	if len(frames) != 2 {
		return 0, fmt.Errorf("%w: replay request: got %d frames, want 2", ErrMalformed, len(frames))
	}
	if len(frames[0]) != 0 {
		return 0, fmt.Errorf("%w: replay request: first frame is %d bytes, want the empty delimiter", ErrMalformed, len(frames[0]))
	}
	return parseSeq(frames[1], "replay request")
}

// ReplayRequest builds the frames a DEALER sends to ask for a snapshot.
func ReplayRequest(startSeq uint64) [][]byte {
	return [][]byte{{}, seqFrame(startSeq)}
}

// LiveFrames builds a live-channel message. payload is not copied.
func LiveFrames(topic string, seq uint64, payload []byte) [][]byte {
	return [][]byte{[]byte(topic), seqFrame(seq), payload}
}

// ReplayFrames builds one replay reply as the engine sends it after the
// ROUTER identity frame. payload is not copied.
func ReplayFrames(seq uint64, payload []byte) [][]byte {
	return [][]byte{{}, seqFrame(seq), payload}
}

// ReplayEnd builds the replay end marker.
func ReplayEnd() [][]byte {
	return [][]byte{{}, seqFrame(ReplayEndSeq), {}}
}

// ReplayFramesTopic builds a replay reply with a topic frame, as vLLM
// 0.26 and later send it. payload is not copied.
func ReplayFramesTopic(topic string, seq uint64, payload []byte) [][]byte {
	return [][]byte{{}, []byte(topic), seqFrame(seq), payload}
}

// ReplayEndTopic builds the end marker of engines that send topic frames:
// its topic frame is empty.
func ReplayEndTopic() [][]byte {
	return [][]byte{{}, {}, seqFrame(ReplayEndSeq), {}}
}
