"""Cloud credentials a step really uses, for `tests/test_secrets.py`: a local S3 that checks signatures (moto's
server with IAM authentication on: a request signed with a wrong secret is refused), an OAuth token endpoint that
verifies a service account's signed assertion, and the step function that uses both from the environment."""

import contextlib
import http.server
import json
import os
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

S3_BUCKET = "secrets-probe"
GCS_BUCKET = "secrets-probe"
PROBE = b"written with the planted credentials"
GCS_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"


@contextlib.contextmanager
def signed_s3(log_path: Path) -> Iterator[SimpleNamespace]:
    """A moto S3 that authenticates every request after its set-up: yields its URL and the access key id and
    secret of a user allowed everything (moto makes the secret: 40 random characters), and its bucket."""
    import boto3

    from tests.support.s3_server import moto_s3_server

    setup_requests = 3  # the three IAM calls below, made before authentication starts
    before = os.environ.get("INITIAL_NO_AUTH_ACTION_COUNT")
    os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = str(setup_requests)
    try:
        server = moto_s3_server(log_path)
        url = server.__enter__()
    finally:
        if before is None:
            os.environ.pop("INITIAL_NO_AUTH_ACTION_COUNT")
        else:
            os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = before
    try:
        iam = boto3.client("iam", endpoint_url=url, region_name="us-east-1", aws_access_key_id="setup",
                           aws_secret_access_key="setup")
        iam.create_user(UserName="planted")
        allow_all = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="planted", PolicyName="all", PolicyDocument=json.dumps(allow_all))
        key = iam.create_access_key(UserName="planted")["AccessKey"]
        found = SimpleNamespace(url=url, key_id=key["AccessKeyId"], secret=key["SecretAccessKey"])
        s3_client(found).create_bucket(Bucket=S3_BUCKET)
        yield found
    finally:
        server.__exit__(None, None, None)


def s3_client(s3: SimpleNamespace, secret: str | None = None):
    """A boto3 S3 client of the planted user (or of its key id with another `secret`)."""
    import boto3

    return boto3.client("s3", endpoint_url=s3.url, region_name="us-east-1", aws_access_key_id=s3.key_id,
                        aws_secret_access_key=secret or s3.secret)


@contextlib.contextmanager
def service_account(key_file: Path, access_token: str) -> Iterator[SimpleNamespace]:
    """A new RSA key written as a service account file whose token URI is a local endpoint; the endpoint verifies
    each assertion's signature with the public key and answers `access_token`. Yields the private key's PEM and
    the verified claims (a list that grows)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from google.auth import jwt

    from tests.support.servers import serve_http

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    verified: list[dict] = []

    class TokenEndpoint(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            form = urllib.parse.parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
            try:
                verified.append(jwt.decode(form["assertion"][0], certs=public, verify=True))
                status, body = 200, {"access_token": access_token, "expires_in": 3600, "token_type": "Bearer"}
            except Exception as e:  # a wrong key or a forged assertion: refused, as Google would
                status, body = 400, {"error": "invalid_grant", "error_description": str(e)}
            out = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args) -> None:
            pass

    with serve_http(http.server.ThreadingHTTPServer(("127.0.0.1", 0), TokenEndpoint)) as url:
        key_file.write_text(json.dumps({
            "type": "service_account", "project_id": "test", "private_key_id": "planted", "private_key": pem,
            "client_email": "planted@test.iam.gserviceaccount.com", "client_id": "1", "token_uri": f"{url}/token"}))
        yield SimpleNamespace(pem=pem, verified=verified)


def use_cloud_credentials(output_path: str) -> dict[str, int]:
    """Write an object to S3 with the AWS keys of the environment and one to GCS with the service account file
    `$GOOGLE_APPLICATION_CREDENTIALS` names, read both back, and keep their sizes: a step reading cloud data."""
    import gcsfs
    import s3fs
    from google.oauth2 import service_account as google_service_account

    s3 = s3fs.S3FileSystem(key=os.environ["AWS_ACCESS_KEY_ID"], secret=os.environ["AWS_SECRET_ACCESS_KEY"],
                           endpoint_url=os.environ["AWS_ENDPOINT_URL_S3"], skip_instance_cache=True)
    s3.pipe(f"{S3_BUCKET}/probe", PROBE)
    credentials = google_service_account.Credentials.from_service_account_file(
        os.environ["GOOGLE_APPLICATION_CREDENTIALS"], scopes=[GCS_SCOPE])
    gcs = gcsfs.GCSFileSystem(token=credentials, project="test", skip_instance_cache=True)
    gcs.pipe(f"{GCS_BUCKET}/probe", PROBE)
    sizes = {"s3_bytes": len(s3.cat(f"{S3_BUCKET}/probe")), "gcs_bytes": len(gcs.cat(f"{GCS_BUCKET}/probe"))}
    os.makedirs(output_path, exist_ok=True)
    Path(output_path, "sizes.json").write_text(json.dumps(sizes))
    return sizes
