#include "plugin/transport/session_frame.h"

#include <cstring>

namespace ftrun {

WireHeader SessionFrames::SealMessage(uint16_t type, std::string_view payload) {
  WireHeader h{};
  h.type = type;
  h.seq = send_seq_++;
  std::string mac = MessageMac(key_, sending_, h.seq, h.type, payload);
  std::memcpy(h.mac, mac.data(), kMacBytes);
  return h;
}

// Only in sequence and with the session's MAC (handshake.h); the caller
// closes the connection on anything else.
Status SessionFrames::OpenMessage(const WireHeader& h, std::string_view payload) {
  if (h.type >= kChallenge) return Status::FailedPrecondition("a handshake message after the handshake");
  if (!MacEqual(std::string_view(h.mac, kMacBytes), MessageMac(key_, receiving_, h.seq, h.type, payload))) {
    return Status::FailedPrecondition("a message of type " + std::to_string(h.type) +
                                      " whose MAC does not match the session key (forged or tampered)");
  }
  if (h.seq != recv_seq_) {
    return Status::FailedPrecondition("a message out of sequence (number " + std::to_string(h.seq) + ", expected " +
                                      std::to_string(recv_seq_) + "): replayed or reordered");
  }
  ++recv_seq_;
  return Status::Ok();
}

BulkHeader SessionFrames::SealBulk(uint64_t tag, uint64_t length) {
  BulkHeader h{};
  h.tag = tag;
  std::string mac = BulkMac(key_, sending_, tag, length);
  std::memcpy(h.mac, mac.data(), kMacBytes);
  return h;
}

bool SessionFrames::OpenBulk(const BulkHeader& h, uint64_t length) {
  return MacEqual(std::string_view(h.mac, kMacBytes), BulkMac(key_, receiving_, h.tag, length));
}

}  // namespace ftrun
