"""SCRAM math (logstore.scram): RFC 7677's test vector, both mechanisms end to end between the
client state machine and the server's functions, escaping, and hostile messages."""

from __future__ import annotations

import base64

import pytest

from logstore.errors import SaslAuthenticationError, UnsupportedSaslMechanismError
from logstore.scram import (
    MECHANISMS,
    ScramClient,
    ScramCredential,
    escape_username,
    make_credential,
    parse_client_final,
    parse_client_first,
    parse_server_first,
    salted_password,
    server_first_message,
    server_signature,
    unescape_username,
    verify_client_proof,
)

pytestmark = pytest.mark.timeout(60)

# RFC 7677 section 3.
RFC_CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_FIRST = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
RFC_CLIENT_FINAL = ("c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    "p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
RFC_SERVER_FINAL = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_rfc_7677_vector_client_side() -> None:
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce=RFC_CLIENT_NONCE)
    assert client.first() == "n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    assert client.final(RFC_SERVER_FIRST) == RFC_CLIENT_FINAL
    client.verify(RFC_SERVER_FINAL)
    with pytest.raises(SaslAuthenticationError, match="signature is wrong"):
        client.verify("v=" + base64.b64encode(b"x" * 32).decode())


def test_rfc_7677_vector_server_side() -> None:
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    credential = ScramCredential.from_salted_password(
        "SCRAM-SHA-256", salt, 4096, salted_password("SCRAM-SHA-256", "pencil", salt, 4096))
    first = parse_client_first("n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert (first.user, first.nonce) == ("user", RFC_CLIENT_NONCE)
    nonce = RFC_SERVER_FIRST.split(",")[0][2:]
    assert server_first_message(nonce, salt, 4096) == RFC_SERVER_FIRST
    without_proof, proof = parse_client_final(RFC_CLIENT_FINAL, nonce)
    auth_message = f"{first.bare},{RFC_SERVER_FIRST},{without_proof}"
    assert verify_client_proof(credential, auth_message, proof)
    assert "v=" + base64.b64encode(server_signature(credential, auth_message)).decode() == RFC_SERVER_FINAL
    wrong = ScramCredential.from_salted_password(
        "SCRAM-SHA-256", salt, 4096, salted_password("SCRAM-SHA-256", "pencil!", salt, 4096))
    assert not verify_client_proof(wrong, auth_message, proof)
    assert not verify_client_proof(credential, auth_message, proof[:-1])


@pytest.mark.parametrize("mechanism", list(MECHANISMS))
@pytest.mark.parametrize("user", ["alice", "a,b=c", "ünïcode"])
def test_a_full_exchange_with_each_mechanism(mechanism: str, user: str) -> None:
    credential = make_credential(mechanism, "correct horse")
    for password, accepted in (("correct horse", True), ("correct hors", False)):
        client = ScramClient(mechanism, user, password)
        first = parse_client_first(client.first())
        assert first.user == user
        server_first = server_first_message(first.nonce + "srv", credential.salt, credential.iterations)
        without_proof, proof = parse_client_final(client.final(server_first), first.nonce + "srv")
        auth_message = f"{first.bare},{server_first},{without_proof}"
        assert verify_client_proof(credential, auth_message, proof) is accepted
        if accepted:
            client.verify("v=" + base64.b64encode(server_signature(credential, auth_message)).decode())


def test_the_stored_credential_holds_no_password_and_repr_no_keys() -> None:
    credential = make_credential("SCRAM-SHA-512", "hunter2")
    assert len(credential.stored_key) == len(credential.server_key) == 64
    assert b"hunter2" not in credential.salt + credential.stored_key + credential.server_key
    assert "stored_key" not in repr(credential) and "salt" not in repr(credential)


def test_user_name_escaping_round_trips_and_rejects_bad_escapes() -> None:
    assert escape_username("a=b,c") == "a=3Db=2Cc"
    assert unescape_username("a=3Db=2Cc") == "a=b,c"
    for bad in ("a=3", "a=41", "a,b"):
        with pytest.raises(SaslAuthenticationError):
            unescape_username(bad)


@pytest.mark.parametrize("message", [
    "", "n,,", "p=tls-unique,,n=u,r=x", "n,a=admin,n=u,r=x", "n,,r=x,n=u", "n,,n=,r=x", "n,,n=u,r=",
    "n,,n=u,r=a b", "n,,n=u,r=x,ext=1", "n,,n=u", "n,," + "n=" + "u" * 5000 + ",r=x",
])
def test_malformed_client_first_messages_are_refused(message: str) -> None:
    with pytest.raises(SaslAuthenticationError):
        parse_client_first(message)


def test_client_final_checks_nonce_binding_and_base64() -> None:
    nonce = "abcdef"
    good = f"c=biws,r={nonce},p=" + base64.b64encode(b"p" * 32).decode()
    assert parse_client_final(good, nonce)[0] == f"c=biws,r={nonce}"
    for bad in (good.replace("r=abcdef", "r=abcdeg"), good.replace("c=biws", "c=cD10bHMt"),
                f"c=biws,r={nonce},p=!!!", f"r={nonce},c=biws,p=AA=="):
        with pytest.raises(SaslAuthenticationError):
            parse_client_final(bad, nonce)


def test_the_client_refuses_a_hostile_server_first_message() -> None:
    for bad in ("r=other-nonce,s=AAAA,i=4096",      # does not extend the client's nonce
                "r=abc,s=AAAA,i=4096",              # equal to it: the server added nothing
                "r=abcX,s=AAAA,i=1000000000",       # billions of iterations: a CPU trap
                "r=abcX,s=AAAA,i=1",                # too few to be a real credential
                "r=abcX,s=%%%,i=4096", "e=other-error"):
        with pytest.raises(SaslAuthenticationError):
            parse_server_first(bad, "abc")


def test_unknown_mechanisms_are_refused() -> None:
    with pytest.raises(UnsupportedSaslMechanismError):
        ScramClient("SCRAM-SHA-1", "u", "p")
    with pytest.raises(UnsupportedSaslMechanismError):
        make_credential("PLAIN", "p")
