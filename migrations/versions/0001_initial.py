"""initial schema: registrations, configurations, experiments, runs, points, requests,
guard results, capacities, verdicts, metric samples; registrations protected by triggers.

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Written out in full (no ORM imports): a released revision must keep meaning what it meant.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# SQLite auto-increments only INTEGER PRIMARY KEY.
ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JSON_DOC = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)

REFUSE_MESSAGE = "plan registrations are immutable: register a new plan instead"

PG_PROTECT = [
    f"""
    CREATE FUNCTION orch_refuse_registration_change() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION '{REFUSE_MESSAGE} (% refused)', TG_OP
            USING ERRCODE = 'integrity_constraint_violation';
    END $$
    """,
    """
    CREATE TRIGGER plan_registrations_immutable
    BEFORE UPDATE OR DELETE ON plan_registrations
    FOR EACH ROW EXECUTE FUNCTION orch_refuse_registration_change()
    """,
    """
    CREATE TRIGGER plan_registrations_no_truncate
    BEFORE TRUNCATE ON plan_registrations
    FOR EACH STATEMENT EXECUTE FUNCTION orch_refuse_registration_change()
    """,
]
PG_UNPROTECT = [
    "DROP TRIGGER IF EXISTS plan_registrations_no_truncate ON plan_registrations",
    "DROP TRIGGER IF EXISTS plan_registrations_immutable ON plan_registrations",
    "DROP FUNCTION IF EXISTS orch_refuse_registration_change()",
]
SQLITE_PROTECT = [
    f"""
    CREATE TRIGGER plan_registrations_no_update BEFORE UPDATE ON plan_registrations
    BEGIN SELECT RAISE(ABORT, '{REFUSE_MESSAGE}'); END
    """,
    f"""
    CREATE TRIGGER plan_registrations_no_delete BEFORE DELETE ON plan_registrations
    BEGIN SELECT RAISE(ABORT, '{REFUSE_MESSAGE}'); END
    """,
]
SQLITE_UNPROTECT = [
    "DROP TRIGGER IF EXISTS plan_registrations_no_update",
    "DROP TRIGGER IF EXISTS plan_registrations_no_delete",
]


def _protect_registrations() -> None:
    dialect = op.get_bind().dialect.name
    for sql in PG_PROTECT if dialect == "postgresql" else SQLITE_PROTECT if dialect == "sqlite" else []:
        op.execute(sql)


def _unprotect_registrations() -> None:
    dialect = op.get_bind().dialect.name
    for sql in PG_UNPROTECT if dialect == "postgresql" else SQLITE_UNPROTECT if dialect == "sqlite" else []:
        op.execute(sql)


def upgrade() -> None:
    op.create_table('deployment_configs',
    sa.Column('id', ID, nullable=False),
    sa.Column('config_sha256', sa.String(length=64), nullable=False),
    sa.Column('label', sa.String(length=300), nullable=False),
    sa.Column('model', sa.String(length=120), nullable=False),
    sa.Column('gpu', sa.String(length=40), nullable=False),
    sa.Column('layout', sa.String(length=20), nullable=False),
    sa.Column('gpus', sa.Integer(), nullable=False),
    sa.Column('tp', sa.Integer(), nullable=False),
    sa.Column('replicas', sa.Integer(), nullable=True),
    sa.Column('prefill_replicas', sa.Integer(), nullable=True),
    sa.Column('prefill_tp', sa.Integer(), nullable=True),
    sa.Column('decode_replicas', sa.Integer(), nullable=True),
    sa.Column('decode_tp', sa.Integer(), nullable=True),
    sa.Column('kv_connector', sa.String(length=20), nullable=True),
    sa.Column('kv_cache_dtype', sa.String(length=10), nullable=False),
    sa.Column('quantization', sa.String(length=10), nullable=False),
    sa.Column('max_num_seqs', sa.Integer(), nullable=False),
    sa.Column('max_num_batched_tokens', sa.Integer(), nullable=False),
    sa.Column('prefix_caching', sa.Boolean(), nullable=False),
    sa.Column('router_policy', sa.String(length=30), nullable=False),
    sa.Column('speculative_method', sa.String(length=20), nullable=True),
    sa.Column('num_speculative_tokens', sa.Integer(), nullable=True),
    sa.Column('engine_version', sa.String(length=40), nullable=False),
    sa.Column('config', JSON_DOC, nullable=False),
    sa.Column('created_at', TIMESTAMP, nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_deployment_configs')),
    sa.UniqueConstraint('config_sha256', name=op.f('uq_deployment_configs_config_sha256'))
    )
    with op.batch_alter_table('deployment_configs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_deployment_configs_engine_version'), ['engine_version'], unique=False)
        batch_op.create_index(batch_op.f('ix_deployment_configs_kv_cache_dtype'), ['kv_cache_dtype'], unique=False)
        batch_op.create_index(batch_op.f('ix_deployment_configs_max_num_seqs'), ['max_num_seqs'], unique=False)
        batch_op.create_index('ix_deployment_configs_model_gpu_layout', ['model', 'gpu', 'layout'], unique=False)
        batch_op.create_index(batch_op.f('ix_deployment_configs_router_policy'), ['router_policy'], unique=False)

    op.create_table('plan_registrations',
    sa.Column('id', ID, nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('canonical_json', sa.Text(), nullable=False),
    sa.Column('registered_at', TIMESTAMP, nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_plan_registrations')),
    sa.UniqueConstraint('sha256', name=op.f('uq_plan_registrations_sha256'))
    )
    op.create_table('experiments',
    sa.Column('id', ID, nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('registration_id', ID, nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('controller_id', sa.String(length=200), nullable=True),
    sa.Column('created_at', TIMESTAMP, nullable=False),
    sa.Column('started_at', TIMESTAMP, nullable=True),
    sa.Column('finished_at', TIMESTAMP, nullable=True),
    sa.ForeignKeyConstraint(['registration_id'], ['plan_registrations.id'], name=op.f('fk_experiments_registration_id_plan_registrations'), ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_experiments')),
    sa.UniqueConstraint('id', 'registration_id', name=op.f('uq_experiments_id_registration_id')),
    sa.UniqueConstraint('name', name=op.f('uq_experiments_name'))
    )
    with op.batch_alter_table('experiments', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_experiments_registration_id'), ['registration_id'], unique=False)

    op.create_table('bar_verdicts',
    sa.Column('id', ID, nullable=False),
    sa.Column('experiment_id', sa.BigInteger(), nullable=False),
    sa.Column('registration_id', ID, nullable=False),
    sa.Column('bar_id', sa.String(length=100), nullable=False),
    sa.Column('verdict', sa.String(length=20), nullable=False),
    sa.Column('estimate', sa.Double(), nullable=True),
    sa.Column('lower', sa.Double(), nullable=True),
    sa.Column('upper', sa.Double(), nullable=True),
    sa.Column('blocks', sa.Integer(), nullable=False),
    sa.Column('judged_at', TIMESTAMP, nullable=False),
    sa.ForeignKeyConstraint(['experiment_id', 'registration_id'], ['experiments.id', 'experiments.registration_id'], name='fk_bar_verdicts_experiment_registration', ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['registration_id'], ['plan_registrations.id'], name=op.f('fk_bar_verdicts_registration_id_plan_registrations'), ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_bar_verdicts')),
    sa.UniqueConstraint('experiment_id', 'bar_id', name=op.f('uq_bar_verdicts_experiment_id_bar_id'))
    )
    with op.batch_alter_table('bar_verdicts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_bar_verdicts_registration_id'), ['registration_id'], unique=False)

    op.create_table('runs',
    sa.Column('id', ID, nullable=False),
    sa.Column('experiment_id', ID, nullable=False),
    sa.Column('config_id', ID, nullable=False),
    sa.Column('arm', sa.String(length=8), nullable=False),
    sa.Column('block', sa.Integer(), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('valid', sa.Boolean(), nullable=True),
    sa.Column('invalid_reason', sa.Text(), nullable=True),
    sa.Column('engine_version', sa.String(length=40), nullable=True),
    sa.Column('image_digest', sa.String(length=200), nullable=True),
    sa.Column('gpu_type', sa.String(length=40), nullable=True),
    sa.Column('nodes', JSON_DOC, nullable=True),
    sa.Column('driver', sa.String(length=40), nullable=True),
    sa.Column('fingerprint', JSON_DOC, nullable=True),
    sa.Column('started_at', TIMESTAMP, nullable=False),
    sa.Column('finished_at', TIMESTAMP, nullable=True),
    sa.ForeignKeyConstraint(['config_id'], ['deployment_configs.id'], name=op.f('fk_runs_config_id_deployment_configs'), ondelete='RESTRICT'),
    sa.ForeignKeyConstraint(['experiment_id'], ['experiments.id'], name=op.f('fk_runs_experiment_id_experiments'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_runs')),
    sa.UniqueConstraint('experiment_id', 'block', 'arm', 'attempt', name=op.f('uq_runs_experiment_id_block_arm_attempt'))
    )
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.create_index('ix_runs_config_id_valid_finished_at', ['config_id', 'valid', 'finished_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_runs_experiment_id'), ['experiment_id'], unique=False)

    op.create_table('capacities',
    sa.Column('id', ID, nullable=False),
    sa.Column('run_id', ID, nullable=False),
    sa.Column('class_name', sa.String(length=60), nullable=False),
    sa.Column('capacity', sa.Double(), nullable=False),
    sa.Column('at_rate', sa.Double(), nullable=True),
    sa.Column('attainment', sa.Double(), nullable=True),
    sa.Column('points_used', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_capacities_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_capacities')),
    sa.UniqueConstraint('run_id', 'class_name', name=op.f('uq_capacities_run_id_class_name'))
    )
    with op.batch_alter_table('capacities', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_capacities_class_name'), ['class_name'], unique=False)

    op.create_table('load_points',
    sa.Column('id', ID, nullable=False),
    sa.Column('run_id', ID, nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('search_class', sa.String(length=60), nullable=True),
    sa.Column('offered_rate', sa.Double(), nullable=True),
    sa.Column('users', sa.Integer(), nullable=True),
    sa.Column('window_start_s', sa.Double(), nullable=False),
    sa.Column('window_end_s', sa.Double(), nullable=False),
    sa.Column('achieved_rate', sa.Double(), nullable=True),
    sa.Column('throughput_tok_s', sa.Double(), nullable=True),
    sa.Column('n_scheduled', sa.Integer(), nullable=True),
    sa.Column('per_class', JSON_DOC, nullable=False),
    sa.Column('percentiles', JSON_DOC, nullable=False),
    sa.Column('valid', sa.Boolean(), nullable=False),
    sa.Column('created_at', TIMESTAMP, nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_load_points_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_load_points'))
    )
    with op.batch_alter_table('load_points', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_load_points_run_id'), ['run_id'], unique=False)

    op.create_table('guard_results',
    sa.Column('id', ID, nullable=False),
    sa.Column('run_id', ID, nullable=False),
    sa.Column('point_id', ID, nullable=True),
    sa.Column('name', sa.String(length=60), nullable=False),
    sa.Column('passed', sa.Boolean(), nullable=False),
    sa.Column('value', sa.Double(), nullable=True),
    sa.Column('threshold', sa.Double(), nullable=True),
    sa.Column('detail', sa.Text(), nullable=False),
    sa.ForeignKeyConstraint(['point_id'], ['load_points.id'], name=op.f('fk_guard_results_point_id_load_points'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_guard_results_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_guard_results'))
    )
    with op.batch_alter_table('guard_results', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_guard_results_point_id'), ['point_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_guard_results_run_id'), ['run_id'], unique=False)

    op.create_table('metric_samples',
    sa.Column('id', ID, nullable=False),
    sa.Column('run_id', ID, nullable=False),
    sa.Column('point_id', ID, nullable=True),
    sa.Column('t', sa.Double(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('labels', JSON_DOC, nullable=False),
    sa.Column('value', sa.Double(), nullable=False),
    sa.ForeignKeyConstraint(['point_id'], ['load_points.id'], name=op.f('fk_metric_samples_point_id_load_points'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_metric_samples_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_metric_samples'))
    )
    with op.batch_alter_table('metric_samples', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_metric_samples_point_id'), ['point_id'], unique=False)
        batch_op.create_index('ix_metric_samples_run_id_name', ['run_id', 'name'], unique=False)

    op.create_table('requests',
    sa.Column('point_id', sa.BigInteger(), nullable=False),
    sa.Column('request_id', sa.Integer(), autoincrement=False, nullable=False),
    sa.Column('conversation_id', sa.Integer(), nullable=False),
    sa.Column('turn', sa.Integer(), nullable=False),
    sa.Column('phase', sa.String(length=10), nullable=False),
    sa.Column('scheduled_s', sa.Double(), nullable=False),
    sa.Column('sent_s', sa.Double(), nullable=True),
    sa.Column('first_token_s', sa.Double(), nullable=True),
    sa.Column('last_token_s', sa.Double(), nullable=True),
    sa.Column('prompt_tokens', sa.Integer(), nullable=False),
    sa.Column('output_tokens_asked', sa.Integer(), nullable=False),
    sa.Column('output_tokens', sa.Integer(), nullable=True),
    sa.Column('cached_tokens', sa.Integer(), nullable=True),
    sa.Column('chunks', sa.Integer(), nullable=False),
    sa.Column('max_gap_s', sa.Double(), nullable=True),
    sa.Column('status', sa.String(length=12), nullable=False),
    sa.Column('http_status', sa.Integer(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('prompt_hash', sa.String(length=64), nullable=False),
    sa.Column('output_hash', sa.String(length=64), nullable=False),
    sa.ForeignKeyConstraint(['point_id'], ['load_points.id'], name=op.f('fk_requests_point_id_load_points'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('point_id', 'request_id', name=op.f('pk_requests'))
    )
    _protect_registrations()


def downgrade() -> None:
    _unprotect_registrations()
    op.drop_table('requests')
    with op.batch_alter_table('metric_samples', schema=None) as batch_op:
        batch_op.drop_index('ix_metric_samples_run_id_name')
        batch_op.drop_index(batch_op.f('ix_metric_samples_point_id'))

    op.drop_table('metric_samples')
    with op.batch_alter_table('guard_results', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_guard_results_run_id'))
        batch_op.drop_index(batch_op.f('ix_guard_results_point_id'))

    op.drop_table('guard_results')
    with op.batch_alter_table('load_points', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_load_points_run_id'))

    op.drop_table('load_points')
    with op.batch_alter_table('capacities', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_capacities_class_name'))

    op.drop_table('capacities')
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_runs_experiment_id'))
        batch_op.drop_index('ix_runs_config_id_valid_finished_at')

    op.drop_table('runs')
    with op.batch_alter_table('bar_verdicts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_bar_verdicts_registration_id'))

    op.drop_table('bar_verdicts')
    with op.batch_alter_table('experiments', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_experiments_registration_id'))

    op.drop_table('experiments')
    op.drop_table('plan_registrations')
    with op.batch_alter_table('deployment_configs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_deployment_configs_router_policy'))
        batch_op.drop_index('ix_deployment_configs_model_gpu_layout')
        batch_op.drop_index(batch_op.f('ix_deployment_configs_max_num_seqs'))
        batch_op.drop_index(batch_op.f('ix_deployment_configs_kv_cache_dtype'))
        batch_op.drop_index(batch_op.f('ix_deployment_configs_engine_version'))

    op.drop_table('deployment_configs')
